"""Settings of the example. The conversations live in turnkeeper; the site's own database
(SQLite, ``CHAT_DATABASE``) holds only its users and their sign-ins."""

import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

# Without DJANGO_SECRET_KEY, a random key per start (runserver's reloads inherit it
# through the environment): sign-ins last until the server stops.
SECRET_KEY = os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(32))
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")

ROOT_URLCONF = "examples.django_chat.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("CHAT_DATABASE") or BASE_DIR / "db.sqlite3",
    }
}
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
LOGIN_URL = "/login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login"
USE_TZ = True

TURNKEEPER_URL = os.environ.get("TURNKEEPER_URL", "http://127.0.0.1:8000")
TURNKEEPER_API_KEY = os.environ.get("TURNKEEPER_API_KEY", "")
CHAT_AGENT = os.environ.get("CHAT_AGENT", "scripted")
