"""The API's pages: a run's page at ``/runs/{id}`` and the runs list at ``/runs``.

Neither page holds data: each is the same document for every run and tenant, and its
scripts (``assets/``, served from this app: the Content-Security-Policy allows no inline
script, no ``eval`` and no other origin) call the API for everything they show.

The run page opens with a page link (``POST /v1/runs/{id}/links``: ``/runs/ID#link=TOKEN
&mode=MODE``). Its script reads the token from the URL fragment (a fragment never reaches a
server or a log), keeps it for the tab (``sessionStorage``), takes it out of the address bar
and sends it only in the Authorization header: the record, the event stream (through
``fetch``: an ``EventSource`` cannot send that header), the pending requests, a turn's diff,
the attempts of the run's group and, with an ``approve`` link, the answers and the steer
box. The token opens that run alone (and its own group: worker/api/links.py); the run page
never asks for an API key.

The runs list asks for the tenant's API key, keeps it for the tab and sends it only in the
Authorization header (never in an address); it opens a run by making a page link for it,
and shows a group's attempts with their pick and the diff of two.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from worker.api import links
from worker.api.errors import ApiError, not_found
from worker.options.spec import RUN_ID

router = APIRouter()

_HERE = resources.files(__package__)
_RUN_PAGE = (_HERE / "run.html").read_text(encoding="utf-8")
_LIST_PAGE = (_HERE / "list.html").read_text(encoding="utf-8")
_MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
ASSETS: dict[str, tuple[bytes, str]] = {
    item.name: (item.read_bytes(), _MEDIA[item.name[item.name.rindex(".") :]])
    for item in (_HERE / "assets").iterdir()
    if item.name.endswith(tuple(_MEDIA))
}
"""The pages' scripts and style by file name, read once at import."""

GROUPS_BY_LINK = ("GET", "/v1/groups/{group}") in links.ROUTES["read"]
"""Whether a page link may read its run's group: the run page asks for the attempts only
then (a refused call would count against the reader's address as a wrong key), and else
points to the runs list, which reads them with the tenant's key."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""A page's Content-Security-Policy: its own scripts and style only (no inline script or
handler, no ``eval``), calls to its own origin only, never framed."""
_PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@router.get("/runs", response_class=HTMLResponse, include_in_schema=False)
async def runs_page() -> HTMLResponse:
    return HTMLResponse(_LIST_PAGE, headers=_PAGE_HEADERS)


@router.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
async def run_page(run_id: str) -> HTMLResponse:
    if not RUN_ID.fullmatch(run_id):  # so it is safe to put in the document as it is
        raise not_found(run_id)
    page = _RUN_PAGE.replace("RUN_ID", run_id).replace("GROUPS_BY_LINK", str(GROUPS_BY_LINK))
    return HTMLResponse(page, headers=_PAGE_HEADERS)


@router.get("/pages/assets/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    found = ASSETS.get(name)
    if found is None:
        raise ApiError(404, "not_found", f"no page asset {name[:40]!r}")
    body, media_type = found
    return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})
