"""`python -m ungater`."""

from lockgate_adapters.service import main_for
from ungater.app import compose
from ungater.settings import UngaterSettings

if __name__ == "__main__":
    main_for(UngaterSettings, compose)
