"""The console's pages: each module here exposes ``routes`` (a list of Starlette routes) and the app collects them
all (:func:`ambient.web.app.page_routes`), so adding a page is adding a file.

A page handler reads ``request.app.state.paths`` (the brain), renders with :func:`ambient.web.render.render`
(``templates/<page>.html`` extending ``base.html``: blocks ``title`` and ``content``; a live part is an element with
``data-live="topics"`` and ``data-fragment="NAME"`` wrapping ``{% block NAME %}``). An action is a POST route
reading ``await request.form()`` (the CSRF field is checked before the handler runs) and answering
:func:`ambient.web.render.redirect_back` with the notice. Template helpers: ``csrf_field()``, ``here`` (the current
path+query, for ``back``), filters ``state_class``, ``when``, ``ago``, ``duration``, ``money``.
"""
