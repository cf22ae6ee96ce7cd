"""Prefect task functions used by the flows in ``trident_flows.flows``."""
