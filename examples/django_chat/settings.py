"""Settings of the example: no database (the conversations live in turnkeeper), the
turnkeeper server and this app's API key from the environment."""

import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

# Nothing here is signed to outlive the process (no sessions): a random key will do.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(32)
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,testserver").split(",")

ROOT_URLCONF = "examples.django_chat.urls"
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
    }
]
USE_TZ = True

TURNKEEPER_URL = os.environ.get("TURNKEEPER_URL", "http://127.0.0.1:8000")
TURNKEEPER_API_KEY = os.environ.get("TURNKEEPER_API_KEY", "")
CHAT_AGENT = os.environ.get("CHAT_AGENT", "scripted")
