"""Running unattended: the Service tab's settings (`config`: restart policy, drain grace, notify URLs) and view
(`panel`), the systemd unit (`systemd`) and its watchdog (`watchdog`). Alerts live in app/backend/alerts.
docs/engine.md "Run as a service"."""
