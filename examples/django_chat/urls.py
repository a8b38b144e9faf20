from django.urls import path

from examples.django_chat import views

urlpatterns = [
    path("", views.page),
    path("messages", views.send),
    path("messages/<path:run_id>/events", views.events),
]
