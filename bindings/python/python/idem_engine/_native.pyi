"""The engine's classes (Rust, through PyO3); the package's API is in
``idem_engine``."""

from typing import Any, Awaitable, List, Optional, Sequence, Tuple, Union

def fingerprint(json: bytes) -> str: ...
def settle(future: Any, ok: bool, value: Any) -> None: ...

class Step:
    key: str
    in_doubt: bool
    def finish(self, result: bytes) -> None: ...
    def finish_async(self, result: bytes) -> Awaitable[None]: ...

class Context:
    fence: Optional[int]
    attempt: int
    takeover: bool
    lease_lost: bool
    def check(self) -> None: ...
    def send(
        self, destination: str, payload: bytes, headers: Sequence[Tuple[str, str]] = ...
    ) -> str: ...
    def begin_step(self, name: str, policy: str) -> Union[Step, bytes, None]: ...
    def begin_step_async(self, name: str, policy: str) -> Awaitable[Union[Step, bytes, None]]: ...

class Run:
    context: Context
    def complete(self, result: Optional[bytes], unencodable: Optional[str] = None) -> None: ...
    def complete_async(
        self, result: Optional[bytes], unencodable: Optional[str] = None
    ) -> Awaitable[None]: ...
    def fail(self, message: str, cls: str) -> Tuple[str, int, Optional[float]]: ...
    def fail_async(self, message: str, cls: str) -> Awaitable[Tuple[str, int, Optional[float]]]: ...
    def release(self) -> None: ...
    def release_async(self) -> Awaitable[None]: ...

class Engine:
    url: str
    def __init__(
        self,
        url: str,
        *,
        lease: Optional[float] = None,
        retention: Optional[float] = None,
        failure_retention: Optional[float] = None,
        wait: Optional[float] = None,
        max_attempts: Optional[int] = None,
        max_result_bytes: Optional[int] = None,
        token: Optional[str] = None,
        keyring: Optional[str] = None,
        key_secret: Optional[str] = None,
        outbox: Optional[str] = None,
    ) -> None: ...
    def begin(
        self, scope: str, key: str, fingerprint: Optional[bytes] = None, wait: Optional[float] = None
    ) -> Union[Run, bytes]: ...
    def begin_async(
        self, scope: str, key: str, fingerprint: Optional[bytes] = None, wait: Optional[float] = None
    ) -> Awaitable[Union[Run, bytes]]: ...
    def record(self, scope: str, key: str) -> Optional[bytes]: ...

Headers = List[Tuple[str, bytes]]
Answer = Tuple[int, Headers, bytes]

class Turn:
    context: Optional[Context]
    def finish(self, status: int, headers: Headers, body: bytes) -> Answer: ...
    def finish_async(self, status: int, headers: Headers, body: bytes) -> Awaitable[Answer]: ...

class HttpGuard:
    def __init__(
        self,
        engine: Engine,
        *,
        methods: Optional[Sequence[str]] = None,
        header: Optional[str] = None,
        required: bool = False,
        fingerprint: Union[str, Sequence[str], None] = None,
        tenant: bool = False,
        max_request_bytes: Optional[int] = None,
        max_response_bytes: Optional[int] = None,
        max_wait: Optional[float] = None,
        default_wait: Optional[float] = None,
        forward_takeovers: bool = False,
        reject_old_uuid_v7: bool = False,
        keep: Optional[str] = None,
        blobs: Optional[str] = None,
        key_in_body: Optional[str] = None,
        webhook: Optional[str] = None,
        webhook_secret: Optional[str] = None,
        mcp: Optional[str] = None,
    ) -> None: ...
    def covers(self, method: str) -> bool: ...
    def begin(
        self,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
        route: Optional[str] = None,
        tenant: Optional[str] = None,
    ) -> Union[Answer, Turn]: ...
    def begin_async(
        self,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
        route: Optional[str] = None,
        tenant: Optional[str] = None,
    ) -> Awaitable[Union[Answer, Turn]]: ...

Settled = Tuple[str, Optional[float], Optional[str], bool, Optional[str], List[Tuple[str, str]]]

class DeliveryTurn:
    context: Context
    key: str
    def complete_async(
        self, result: Optional[bytes], unencodable: Optional[str] = None
    ) -> Awaitable[Settled]: ...
    def fail_async(self, message: str, cls: str) -> Awaitable[Settled]: ...

class ConsumerGuard:
    def __init__(
        self,
        engine: Engine,
        scope: str,
        *,
        keys: Optional[Sequence[str]] = None,
        fingerprint: Optional[bool] = None,
        name: Optional[str] = None,
        min_retry_delay: Optional[float] = None,
        max_retry_delay: Optional[float] = None,
    ) -> None: ...
    def begin_async(
        self,
        payload: bytes,
        headers: List[Tuple[str, str]],
        message_id: Optional[str] = None,
        delivery_count: Optional[int] = None,
    ) -> Awaitable[Union[Settled, DeliveryTurn]]: ...
