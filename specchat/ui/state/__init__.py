"""What the app creates once and hands down to screens and widgets: the model lease, the live
statistics, the command table, preferences and auto-saving. No widgets here, and nothing here
imports a screen."""
