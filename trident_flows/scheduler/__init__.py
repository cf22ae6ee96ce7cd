"""The Trident scheduler: observe -> regime -> optimize -> placement -> transition, and the baseline policies. Pure Python on the core types: no Ray or Prefect imports, nothing of the runtime."""
