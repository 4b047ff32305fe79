"""The web UI's files, served by queue-store beside the admin API it calls.

Why beside the API: one origin, so the page calls the API with no CORS and the browser's
same-origin rule keeps other sites' pages from reading the answers. The files hold no data and
no secret, so they are served without a token; every datum comes from the API, which the page
calls with `Authorization: Bearer <token>` from JavaScript. The token is typed into the page,
kept in the tab's sessionStorage, and never sent in a URL or a cookie: a cookie would ride along
on a request another site's page makes (CSRF), a header does not. The API refuses a read-only
token on every call that changes something (`admin_api`), so the UI's hiding of actions is a
courtesy, not the check.

Every file is written here (vanilla JS, CSS and SVG): no CDN, no build step, and the Content
Security Policy below lets the page load nothing from anywhere else.

    GET /          -> 302 /ui/
    GET /ui/       the page (hash routes: #/queues/NAME, #/jobsets/Q/J, #/pods/C/NS/P, ...)
    GET /ui/{file} app.js, app.css, favicon.svg
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

UI_PREFIX = "/ui/"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
FILES = ("index.html", "app.js", "app.css", "favicon.svg")
# The page may load and call only its own origin; no inline script, no framing, no plugins.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """Paths served without a token: the UI's files and the root redirect."""
    return path == "/" or path == UI_PREFIX.rstrip("/") or path.startswith(UI_PREFIX)


def register(app: web.Application) -> None:
    files = {name: (resources.files("queue_store").joinpath("ui", name).read_bytes(),
                    _TYPES[name[name.rindex("."):]]) for name in FILES}

    async def root(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(UI_PREFIX)

    async def serve(request: web.Request) -> web.Response:
        name = request.match_info.get("file") or "index.html"
        found = files.get(name)
        if found is None:
            raise web.HTTPNotFound(text=f"no UI file {name!r}")
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type,
                                                **SECURITY_HEADERS})

    app.router.add_get("/", root)
    app.router.add_get("/ui", root)
    app.router.add_get(UI_PREFIX, serve)
    app.router.add_get(UI_PREFIX + "{file}", serve)
