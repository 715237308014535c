"""Helmline API service: the HTTP API and web console; user intents become events."""
