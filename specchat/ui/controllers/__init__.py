"""The chat's controllers: what a key or a message does to the shared state (replies, sending,
step mode, the control keys, themes, loading, the palette; talk mode's are in :mod:`specchat.ui.talk`).
Each gets what it needs through its constructor, typed by a host Protocol, never the whole app."""
