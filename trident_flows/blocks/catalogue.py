"""How the blocks present themselves in the Prefect UI's block catalogue: documentation and logo.

The logo is ``logo.png`` beside this module (a square 256 px PNG); ``LOGO_URL`` is where the
project's repository serves that file, ``DOCUMENTATION_URL`` the Prefect walk-through
(``docs/prefect.md``) there. Both follow ``REPOSITORY_URL``.
"""

from __future__ import annotations

from pathlib import Path

REPOSITORY_URL = "https://github.com/trident-flows/trident-flows"
BRANCH = "main"
LOGO_FILE = Path(__file__).with_name("logo.png")
LOGO_PATH = "trident_flows/blocks/logo.png"  # LOGO_FILE's path in the repository
LOGO_URL = f"{REPOSITORY_URL.replace('https://github.com', 'https://raw.githubusercontent.com')}/{BRANCH}/{LOGO_PATH}"
DOCUMENTATION_URL = f"{REPOSITORY_URL}/blob/{BRANCH}/docs/prefect.md"
