"""The web console (``ambient web``, or hosted by the daemon when ``web:`` is set): a Starlette app over the query
store and the actions, live by server-sent events driven by the files the daemon writes, behind a token, CSRF
checks and a strict Content-Security-Policy.
"""
