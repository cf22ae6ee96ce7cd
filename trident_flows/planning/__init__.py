"""Capacity planning: which nodes to rent for a corpus, and what one more node would buy.

``catalogue`` (node classes and prices), ``workload`` (the corpus's mix of items, from regimes or a
measured sample), ``demands`` (the placement MILP's inputs), ``sizing`` (node counts as MILP
variables; resource prices), ``planner`` (the search and its checks), ``simcheck`` (a plan in the
simulator), ``report`` (JSON, table, Pareto plot), ``advice`` (the binding resource and the gain of
one more node for a running pipeline).
"""
