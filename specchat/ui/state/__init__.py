"""What the app creates once and hands down to screens and widgets: the model lease, the control
rules, auto-saving and the theory tracker. No widgets here, and nothing here imports a screen."""
