from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_BATCH: _ClassVar[EntryKind]
    ENTRY_KIND_NOOP: _ClassVar[EntryKind]
    ENTRY_KIND_INF: _ClassVar[EntryKind]
ENTRY_KIND_BATCH: EntryKind
ENTRY_KIND_NOOP: EntryKind
ENTRY_KIND_INF: EntryKind

class Ballot(_message.Message):
    __slots__ = ("round", "leader")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    round: int
    leader: str
    def __init__(self, round: _Optional[int] = ..., leader: _Optional[str] = ...) -> None: ...

class ClockEntry(_message.Message):
    __slots__ = ("shard", "counter")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    shard: int
    counter: int
    def __init__(self, shard: _Optional[int] = ..., counter: _Optional[int] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("kind", "records", "counters", "watermark", "vw", "epoch")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    VW_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    kind: EntryKind
    records: _containers.RepeatedScalarFieldContainer[bytes]
    counters: _containers.RepeatedScalarFieldContainer[int]
    watermark: int
    vw: _containers.RepeatedCompositeFieldContainer[ClockEntry]
    epoch: int
    def __init__(self, kind: _Optional[_Union[EntryKind, str]] = ..., records: _Optional[_Iterable[bytes]] = ..., counters: _Optional[_Iterable[int]] = ..., watermark: _Optional[int] = ..., vw: _Optional[_Iterable[_Union[ClockEntry, _Mapping]]] = ..., epoch: _Optional[int] = ...) -> None: ...

class Prepare(_message.Message):
    __slots__ = ("stream", "ballot", "from_slot")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    FROM_SLOT_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    from_slot: int
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., from_slot: _Optional[int] = ...) -> None: ...

class AcceptedEntry(_message.Message):
    __slots__ = ("slot", "ballot", "entry")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    slot: int
    ballot: Ballot
    entry: Entry
    def __init__(self, slot: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class Promise(_message.Message):
    __slots__ = ("stream", "ballot", "from_slot", "accepted", "complete")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    FROM_SLOT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    from_slot: int
    accepted: _containers.RepeatedCompositeFieldContainer[AcceptedEntry]
    complete: bool
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., from_slot: _Optional[int] = ..., accepted: _Optional[_Iterable[_Union[AcceptedEntry, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...

class Accept(_message.Message):
    __slots__ = ("stream", "ballot", "slot", "entry", "chosen_through")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_THROUGH_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    slot: int
    entry: Entry
    chosen_through: int
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., slot: _Optional[int] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ..., chosen_through: _Optional[int] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("stream", "ballot", "slot")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    slot: int
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., slot: _Optional[int] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("stream", "ballot", "promised")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    PROMISED_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    promised: Ballot
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., promised: _Optional[_Union[Ballot, _Mapping]] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("stream", "ballot", "chosen_through")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_THROUGH_FIELD_NUMBER: _ClassVar[int]
    stream: int
    ballot: Ballot
    chosen_through: int
    def __init__(self, stream: _Optional[int] = ..., ballot: _Optional[_Union[Ballot, _Mapping]] = ..., chosen_through: _Optional[int] = ...) -> None: ...

class Fetch(_message.Message):
    __slots__ = ("stream", "from_slot", "to_slot")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_SLOT_FIELD_NUMBER: _ClassVar[int]
    TO_SLOT_FIELD_NUMBER: _ClassVar[int]
    stream: int
    from_slot: int
    to_slot: int
    def __init__(self, stream: _Optional[int] = ..., from_slot: _Optional[int] = ..., to_slot: _Optional[int] = ...) -> None: ...

class Chosen(_message.Message):
    __slots__ = ("stream", "first_slot", "entries")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FIRST_SLOT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    stream: int
    first_slot: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, stream: _Optional[int] = ..., first_slot: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class ReplicationMessage(_message.Message):
    __slots__ = ("prepare", "promise", "accept", "accepted", "reject", "commit", "fetch", "chosen")
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    PROMISE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    prepare: Prepare
    promise: Promise
    accept: Accept
    accepted: Accepted
    reject: Reject
    commit: Commit
    fetch: Fetch
    chosen: Chosen
    def __init__(self, prepare: _Optional[_Union[Prepare, _Mapping]] = ..., promise: _Optional[_Union[Promise, _Mapping]] = ..., accept: _Optional[_Union[Accept, _Mapping]] = ..., accepted: _Optional[_Union[Accepted, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., fetch: _Optional[_Union[Fetch, _Mapping]] = ..., chosen: _Optional[_Union[Chosen, _Mapping]] = ...) -> None: ...

class ReplicationBatch(_message.Message):
    __slots__ = ("src", "messages")
    SRC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    src: str
    messages: _containers.RepeatedCompositeFieldContainer[ReplicationMessage]
    def __init__(self, src: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ReplicationMessage, _Mapping]]] = ...) -> None: ...
