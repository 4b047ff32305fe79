"""`python -m cluster_watcher`."""

from cluster_watcher.app import compose
from cluster_watcher.settings import WatcherSettings
from lockgate_adapters.service import main_for

if __name__ == "__main__":
    main_for(WatcherSettings, compose)
