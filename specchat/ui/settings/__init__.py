"""What the user configures for the chat: keys (:mod:`.keys`), themes (:mod:`.themes`) and the
choices the app remembers in the config file (:mod:`.remembered`). Tables and checks, no widgets."""
