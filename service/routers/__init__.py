"""One router per resource; :func:`service.app.create_app` includes them all."""
