"""Run the example: ``python examples/django_chat/manage.py runserver`` from the repo root."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_chat.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
