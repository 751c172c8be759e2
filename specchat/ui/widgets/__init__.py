"""specchat's widgets: transcript, live panels, message box."""
