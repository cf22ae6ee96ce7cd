"""The Trident scheduler: observe -> regime -> optimize -> placement -> controller. Pure Python, no Ray or Prefect imports."""
