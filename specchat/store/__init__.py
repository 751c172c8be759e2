"""What specchat keeps on disk for the user: saved conversations (:mod:`.conversation`, the data and
its JSON; :mod:`.folder`, the files; :mod:`.markdown`, the export). No UI: the CLI and the app
both use it."""
