"""Talk mode, one room: the race, the exactness self-test, the theory panel with its tracker and
the γ advisor, and the replay of a saved conversation.

- :mod:`.screens` opens them (:class:`~specchat.ui.talk.screens.TalkScreens`), handing each the
  model lease, the palette, the keys and the command table through its constructor;
- :mod:`.rules`: whether one may open now, the race's prompt, applying the advisor's γ;
- :mod:`.race`, :mod:`.selftest`, :mod:`.replay`: the screens;
- :mod:`.theory` (the panel and its plain probe) and :mod:`.theory_tracker` (what this session
  measured, the formulas and the advisor's curve).

Their jobs reach the models only through the lease (:func:`specchat.ui.state.lease.run_job`).
"""
