"""The operator console: memory, its history, the queue and the lifecycle in a browser.

``memstore serve --console`` mounts ``app.create_console_app`` under ``/console``; docs/console.md
describes the pages and the security model (``security.py``).
"""
