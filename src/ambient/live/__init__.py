"""Live context (spec/001): one thread per agent shared by all requesters, and the agent's handoff.

``turn`` (a turn and the record a packet adds; pure), ``handoff`` (the bounded summary with stable rubrics; pure),
``threads`` (the thread files: append, rotate, read, views) and ``context`` (``LiveContext``: the threads with each
one's ``handoff.md``)."""
