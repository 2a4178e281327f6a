"""Running unattended: panel-level service settings, alert notifications (Apprise), systemd integration."""
