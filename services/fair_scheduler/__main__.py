"""`python -m fair_scheduler`."""

from fair_scheduler.app import compose
from fair_scheduler.settings import SchedulerSettings
from lockgate_adapters.service import main_for

if __name__ == "__main__":
    main_for(SchedulerSettings, compose)
