"""The chat's controllers: what a key or a message does to the shared state (replies, sending,
step mode, talk screens, themes, loading, the palette). Each gets what it needs through its
constructor, typed by a host Protocol, never the whole app."""
