"""trident-flows: adaptive scheduling of multimodal data-curation pipelines (Trident, arXiv 2603.02075) on Ray and Prefect."""

__version__ = "0.1.0"
