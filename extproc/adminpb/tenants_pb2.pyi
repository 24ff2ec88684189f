from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TenantsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class SpendWindowUsage(_message.Message):
    __slots__ = ("window", "id", "used", "limit", "resets_at")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RESETS_AT_FIELD_NUMBER: _ClassVar[int]
    window: str
    id: str
    used: float
    limit: float
    resets_at: str
    def __init__(self, window: _Optional[str] = ..., id: _Optional[str] = ..., used: _Optional[float] = ..., limit: _Optional[float] = ..., resets_at: _Optional[str] = ...) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("name", "tenant_class", "tier", "suspended", "unit", "windows", "listed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_CLASS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant_class: str
    tier: str
    suspended: bool
    unit: str
    windows: _containers.RepeatedCompositeFieldContainer[SpendWindowUsage]
    listed: bool
    def __init__(self, name: _Optional[str] = ..., tenant_class: _Optional[str] = ..., tier: _Optional[str] = ..., suspended: _Optional[bool] = ..., unit: _Optional[str] = ..., windows: _Optional[_Iterable[_Union[SpendWindowUsage, _Mapping]]] = ..., listed: _Optional[bool] = ...) -> None: ...

class TenantsReply(_message.Message):
    __slots__ = ("tenants", "spend_store_up")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    SPEND_STORE_UP_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantUsage]
    spend_store_up: bool
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantUsage, _Mapping]]] = ..., spend_store_up: _Optional[bool] = ...) -> None: ...
