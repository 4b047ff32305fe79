"""`python -m queue_store`."""

from lockgate_adapters.service import main_for
from queue_store.app import compose
from queue_store.settings import QueueStoreSettings

if __name__ == "__main__":
    main_for(QueueStoreSettings, compose)
