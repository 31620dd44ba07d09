"""A tiny client of Airflow's public REST API on :mod:`httpx`: every call answers ``(status, document)``, whatever
the status (the body as JSON, ``None`` when empty, the text when not JSON), or raises :class:`ApiConnectionError`."""

from __future__ import annotations

import ssl
from functools import lru_cache
from typing import Any

import httpx

__all__ = ["ApiClient", "ApiConnectionError"]


class ApiConnectionError(OSError):
    """No HTTP answer: refused, timed out or dropped (wraps the :class:`httpx.TransportError`)."""


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    # The system's CA store, built once (httpx builds a new one per client otherwise).
    return ssl.create_default_context()


class ApiClient:
    """Authenticated with a JWT from ``/auth/token``, fetched once; a connection per call (thread-safe, nothing to close)."""

    def __init__(self, base_url: str, user: str, password: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.password = password
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        url = f"{self.base_url}{path}"
        try:
            with httpx.Client(verify=_ssl_context(), timeout=self.timeout_s, follow_redirects=True) as http:
                response = http.request(method, url, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise ApiConnectionError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if not response.content:
            return response.status_code, None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def healthy(self) -> bool:
        """Whether the API server answers its health check with 200 (False when it cannot be reached)."""
        try:
            return self._request("GET", "/api/v2/monitor/health", auth=False)[0] == 200
        except OSError:
            return False

    def token(self) -> str:
        """The JWT for ``user`` (logged in once, then cached); RuntimeError when the login is refused."""
        if self._token is None:
            status, doc = self._request("POST", "/auth/token", {"username": self.user, "password": self.password}, auth=False)
            if status not in (200, 201) or not isinstance(doc, dict) or "access_token" not in doc:
                raise RuntimeError(f"cannot log in as {self.user!r}: HTTP {status} {doc!r}")
            self._token = str(doc["access_token"])
        return self._token

    def get(self, path: str) -> tuple[int, Any]:
        return self._request("GET", path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self._request("POST", path, body)

    def put(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self._request("PUT", path, body)

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's document, or None when the API does not know it (yet)."""
        status, doc = self.get(f"/api/v2/dags/{dag_id}")
        return doc if status == 200 and isinstance(doc, dict) else None

    def set_paused(self, dag_id: str, paused: bool) -> bool:
        return self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})[0] == 200
