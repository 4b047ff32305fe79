"""`python -m admission_webhook`."""

from admission_webhook.app import compose
from admission_webhook.settings import WebhookSettings
from lockgate_adapters.service import main_for

if __name__ == "__main__":
    main_for(WebhookSettings, compose)
