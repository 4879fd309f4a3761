"""``kind: qdrant``: vector collections on Qdrant through qdrant-client.

Connection (first that applies):
- ``url`` (+ ``api_key``), or ``auth: <credential>`` whose record has ``url`` and
  ``api_key`` (aliases ``key``, ``token``): a Qdrant server;
- ``path``: qdrant-client local mode, on disk; relative paths resolve against the
  execution's data directory; the default is ``<data_dir>/qdrant``.

Local mode lets one client open a path at a time (a second one, even in the same
process, fails), so clients are shared per process: :func:`shared_client` keeps
one per path (and one per server URL + key), and the tool, the Dagster
``QdrantResource`` and the Qdrant IO manager all go through it. Calls on a local
client are serialised by a lock (its in-memory index is not thread-safe).

Operations (``operation``, default ``query`` when a ``vector``/``text`` is given,
else ``upsert`` when points are given):

- ``create``: ``collection``, ``dimension`` (alias ``size``), ``distance``
  (cosine | dot | euclid | manhattan; default cosine), ``if_exists``
  (``ok`` default: keep it but require the same dimension | ``recreate`` | ``error``).
  Result ``{collection, operation, created, dimension, distance, count}``.
- ``upsert``: points from ``points`` | ``records`` | ``input`` | ``data``: a list
  of ``{id, vector, payload}`` (without ``payload``, the other keys are the
  payload), an Arrow table with a vector column (``vector_column``, default
  ``vector``; ``id_column``, default ``id``; other columns are the payload), a
  ``{rows: [...]}`` result, or a ``$ref`` to either; or ``vectors`` + ``payloads``
  + ``ids`` lists. Ids are unsigned integers or UUIDs; any other string id maps
  to a stable UUID (uuid5) and is kept in the payload as ``_id`` (hits report it
  as their ``id``), so re-upserting the same records replaces them.
  ``embedding`` (e.g. ``{model: hashing, dim: 384}``) embeds a record's
  ``text`` (``text_field``) when it has no vector. ``create_if_missing: true``
  creates the collection with the data's dimension and ``distance``.
  Result ``{collection, operation, count, points_count}``.
- ``query``: ``vector`` (or ``text`` with ``embedding``), ``limit`` (10),
  ``filter``, ``with_payload`` (true), ``with_vectors`` (false),
  ``score_threshold``, ``offset``. Uses ``query_points``.
  Result ``{collection, operation, hits: [{id, score, payload}], count}``.
- ``delete``: ``ids`` and/or ``filter`` (one is required). Result
  ``{collection, operation, count (deleted), points_count}``.
- ``retrieve``: ``ids`` -> ``{points, count}``; ``scroll``: ``filter``, ``limit``,
  ``offset`` -> ``{points, count, next_offset}``; ``count``: ``filter`` -> ``{count}``;
  ``info`` -> ``{dimension, distance, count}``; ``drop`` removes the collection.

``filter`` is Qdrant's own filter JSON (``{must: [{key: city, match: {value: x}}]}``)
or a shorthand ``{field: value}`` (match), ``{field: [a, b]}`` (any of),
``{field: {gte: 1, lt: 5}}`` (range), ``{field: {any|except|text|value: ...}}``;
several fields must all match.

Errors are error outcomes: ``qdrant_not_found`` (missing collection),
``qdrant_dimension`` (vector of the wrong size), ``qdrant_unavailable`` (server
down or timing out; retryable), ``qdrant_locked`` (local path held by another
process; retryable), ``qdrant_bad_request``, ``qdrant_auth``, ``config_error``.

Modules: ``client`` (shared clients, errors), ``collection``, ``points``, ``query``,
``tool`` (the kind), ``embeddings`` (text -> vectors).
"""

from noetl_dagster.engine.ports import ToolError  # noqa: F401
from noetl_dagster.tools.qdrant.client import (  # noqa: F401
    _HTTP_RETRYABLE,
    _ID_NAMESPACE,
    _NATIVE_FILTER_KEYS,
    DEFAULT_BATCH,
    DISTANCES,
    KIND,
    OPERATIONS,
    ORIGINAL_ID_KEY,
    SharedClient,
    _clients,
    _clients_lock,
    _key_digest,
    _response_message,
    release_all,
    release_client,
    shared_client,
    translate_error,
)
from noetl_dagster.tools.qdrant.collection import (  # noqa: F401
    CollectionInfo,
    collection_dimension,
    collection_exists,
    collection_info,
    create_collection,
    parse_distance,
)
from noetl_dagster.tools.qdrant.points import (  # noqa: F401
    PointSet,
    _is_arrow,
    _load_ref,
    _vector,
    count_points,
    point_id,
    points_from_arrow,
    points_from_records,
    to_points,
    upsert_points,
)
from noetl_dagster.tools.qdrant.query import (  # noqa: F401
    _RANGE_KEYS,
    _condition,
    _ids,
    _payload_selector,
    _point_out,
    build_filter,
    query_points,
)
from noetl_dagster.tools.qdrant.tool import (  # noqa: F401
    _client_for,
    _embedder,
    _int,
    _resolve_path,
    _source,
    data_dir_of,
    qdrant_tool,
)
