"""The response-v2 envelope as pydantic models: the source of ``schemas/response-v2.schema.json``.

Kept apart from `ftl.surfaces.envelope` (which builds envelopes as plain dicts) so that printing an
envelope never imports pydantic; ``ftl.surfaces.envelope.ResponseV2`` still names these classes.
Shape: foundry-mcp response-v2, errors-and-gates reference §2.1-2.4.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WarningDetail(BaseModel):
    code: str
    severity: Literal["info", "warning", "error"]
    message: str
    context: dict[str, Any] = Field(default_factory=dict)


class Meta(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: Literal["response-v2"]
    request_id: str
    warnings: list[str] = Field(default_factory=list)
    warning_details: list[WarningDetail] = Field(default_factory=list)


class ResponseV2(BaseModel):
    """The response-v2 envelope; the source of ``schemas/response-v2.schema.json``.

    ``success: true`` goes with ``error: null``; ``success: false`` with a non-empty error and
    ``data`` holding ``error_code``, ``error_type``, ``details`` and ``remediation``.
    """

    success: bool
    data: Any = Field(default_factory=dict)
    error: str | None
    meta: Meta

    @model_validator(mode="after")
    def _consistent(self) -> "ResponseV2":
        if self.success and self.error is not None:
            raise ValueError("success: true must have error: null")
        if not self.success and not self.error:
            raise ValueError("success: false needs a non-empty error")
        return self
