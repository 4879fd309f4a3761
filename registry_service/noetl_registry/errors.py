"""Registry errors; each maps to one HTTP status, so both clients raise the same types."""

from __future__ import annotations


class RegistryError(Exception):
    status = 500
    code = "registry_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidRequest(RegistryError):
    status = 422
    code = "invalid_request"


class PayloadTooLarge(InvalidRequest):
    """A request body over the service's limit (an InvalidRequest, so callers need no new except)."""

    status = 413
    code = "payload_too_large"


class Unauthorized(RegistryError):
    status = 401
    code = "unauthorized"


class Forbidden(RegistryError):
    status = 403
    code = "forbidden"


class NotFound(RegistryError):
    status = 404
    code = "not_found"


class Conflict(RegistryError):
    status = 409
    code = "conflict"


ERRORS_BY_STATUS: dict[int, type[RegistryError]] = {
    cls.status: cls for cls in (InvalidRequest, PayloadTooLarge, Unauthorized, Forbidden, NotFound, Conflict)
}
ERRORS_BY_STATUS[400] = InvalidRequest
