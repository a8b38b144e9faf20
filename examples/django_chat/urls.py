from django.contrib.auth import views as auth
from django.urls import path

from examples.django_chat import views

urlpatterns = [
    path("", views.page),
    path("login", auth.LoginView.as_view()),
    path("logout", auth.LogoutView.as_view()),
    path("messages", views.send),
    path("messages/<path:run_id>/events", views.events),
]
