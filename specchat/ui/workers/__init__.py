"""The engine's side of the UI: thread workers that load the models and stream replies, and the
messages they post back (:mod:`.bridge`, :mod:`.model_loading`, :mod:`.messages`)."""
