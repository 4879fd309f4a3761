"""The examples of seed 002 (flow syntax), verbatim: flow text and, where the
seed draws one, its mermaid diagram."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    name: str
    flow: str
    mermaid: str | None = None


# -- examples with a diagram -------------------------------------------------------------------

SEPARATE_STATEMENTS = Example(
    "separate statements",
    "A → B → D\nC → D",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "D" as D.3
state "C" as C.4
state "D" as D.5
[*]-->A.1
[*]-->C.4
A.1-->B.2
B.2-->D.3
D.3-->[*]
C.4-->D.5
D.5-->[*]
""",
)

SEMICOLON = Example("semicolon", "A → B → D;\nC → D", SEPARATE_STATEMENTS.mermaid)

OUTPUT_LABEL = Example(
    "output label",
    "A :x → B → C;\n:x → D",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
state "D" as D.4
[*]-->A.1
A.1-->B.2
A.1-->D.4
B.2-->C.3
C.3-->[*]
D.4-->[*]
""",
)

OUTPUT_THEN_INPUT_LABEL = Example(
    "output then input label in one statement",
    "A :x → B → C → :x D",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
state "D" as D.4
[*]-->A.1
A.1-->B.2
A.1-->D.4
B.2-->C.3
C.3-->D.4
D.4-->[*]
""",
)

EXPLICIT_INPUTS = Example(
    "inputs explicitly connected",
    "A → :x;\nB → :x;\n:x C",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
[*]-->A.1
[*]-->B.2
[*]-->C.3
A.1-->C.3
B.2-->C.3
C.3-->[*]
""",
)

MEET = Example(
    "meet",
    "A → :meet C → D → E\nB → :meet",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "C" as C.2
state "D" as D.3
state "E" as E.4
state "B" as B.5
[*]-->A.1
[*]-->B.5
A.1-->C.2
C.2-->D.3
D.3-->E.4
E.4-->[*]
B.5-->C.2
""",
)

OUTPUT_AS_INPUT = Example(
    "output of A as the input to B",
    "A :out → C → D → E ;\n:out → B",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "C" as C.2
state "D" as D.3
state "E" as E.4
state "B" as B.5
[*]-->A.1
A.1-->C.2
A.1-->B.5
C.2-->D.3
D.3-->E.4
E.4-->[*]
B.5-->[*]
""",
)

# The seed writes ":before A → B → C" (an input label on A) but draws the diagram of
# ":before → A → B → C" (a label as the statement's source), which is what its reference
# test file says; the input-label form keeps its start edge (see EXPLICIT_INPUTS).
LABEL_AT_START = Example(
    "label at the start of a statement",
    ":before → A → B → C\nD → :before",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
state "D" as D.4
[*]-->D.4
A.1-->B.2
B.2-->C.3
C.3-->[*]
D.4-->A.1
""",
)
LABEL_AT_START_AS_WRITTEN = ":before A → B → C\nD → :before"

SUBFLOW = Example(
    "subflow",
    "A → [ B C ] → D",
    """stateDiagram-v2
direction LR
state "A" as A.1
state _start_2_ <<fork>>
state "B" as B.3
state "C" as C.4
state _end_5_ <<join>>
state "D" as D.6
[*]-->A.1
A.1-->_start_2_
_start_2_-->B.3
_start_2_-->C.4
B.3-->_end_5_
C.4-->_end_5_
_end_5_-->D.6
D.6-->[*]
""",
)

SUBFLOW_START_END = Example(
    "subflow with :start and :end",
    "A → [ :start → B → C → :end ] → D",
    """stateDiagram-v2
direction LR
state "A" as A.1
state _start_2_ <<fork>>
state "B" as B.3
state "C" as C.4
state _end_5_ <<join>>
state "D" as D.6
[*]-->A.1
A.1-->_start_2_
_start_2_-->B.3
B.3-->C.4
C.4-->_end_5_
_end_5_-->D.6
D.6-->[*]
""",
)

IMPLIED_START_END = Example(
    "implied start and end",
    "A → B → C\nD → E\nF → B",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
state "D" as D.4
state "E" as E.5
state "F" as F.6
state "B" as B.7
[*]-->A.1
[*]-->D.4
[*]-->F.6
A.1-->B.2
B.2-->C.3
C.3-->[*]
D.4-->E.5
E.5-->[*]
F.6-->B.7
B.7-->[*]
""",
)
EXPLICIT_START_END = Example(
    "explicit start and end",
    ":start → A → B → C → :end\n:start → D → E → :end\n:start → F → B → :end",
    IMPLIED_START_END.mermaid,
)

MERGE_INPUTS = Example(
    "two inputs to B",
    "A → :x B\nC → :x",
    """stateDiagram-v2
direction LR
state "A" as A.1
state "B" as B.2
state "C" as C.3
[*]-->A.1
[*]-->C.3
A.1-->B.2
B.2-->[*]
C.3-->B.2
""",
)
MERGE_OPERATOR = Example("merge operator", "A → :x > B\nC → :x", MERGE_INPUTS.mermaid)

FAN_IN_SUBFLOW = Example(
    "fan in as a subflow",
    "{ A B C } → D",
    """stateDiagram-v2
direction LR
state _start_1_ <<fork>>
state "A" as A.2
state "B" as B.3
state "C" as C.4
state _end_5_ <<join>>
state "D" as D.6
[*]-->_start_1_
_start_1_-->A.2
_start_1_-->B.3
_start_1_-->C.4
A.2-->_end_5_
B.3-->_end_5_
C.4-->_end_5_
_end_5_-->D.6
D.6-->[*]
""",
)
FAN_IN_BAR = Example("fan in with |", "A|B|C → D", FAN_IN_SUBFLOW.mermaid)
FAN_IN_LABELS = ["A → :meet D\nB → :meet ;\nC → :meet", "A → :meet ;\nB → :meet ;\nC → :meet ;\n:meet → D"]

FAN_OUT_SUBFLOW = Example(
    "fan out as a subflow",
    "D → { A B C }",
    """stateDiagram-v2
direction LR
state "D" as D.1
state _start_2_ <<fork>>
state "A" as A.3
state "B" as B.4
state "C" as C.5
state _end_6_ <<join>>
[*]-->D.1
D.1-->_start_2_
_start_2_-->A.3
_start_2_-->B.4
_start_2_-->C.5
A.3-->_end_6_
B.4-->_end_6_
C.5-->_end_6_
_end_6_-->[*]
""",
)
FAN_OUT_BAR = Example("fan out with |", "D → A|B|C", FAN_OUT_SUBFLOW.mermaid)
FAN_OUT_LABELS = ["D :join → A ;\n:join → B ;\n:join → C", "D → :join\n:join → A ;\n:join → B ;\n:join → C"]

WITH_DIAGRAMS = [
    SEPARATE_STATEMENTS,
    SEMICOLON,
    OUTPUT_LABEL,
    OUTPUT_THEN_INPUT_LABEL,
    EXPLICIT_INPUTS,
    MEET,
    OUTPUT_AS_INPUT,
    LABEL_AT_START,
    SUBFLOW,
    SUBFLOW_START_END,
    IMPLIED_START_END,
    EXPLICIT_START_END,
    MERGE_INPUTS,
    MERGE_OPERATOR,
    FAN_IN_SUBFLOW,
    FAN_IN_BAR,
    FAN_OUT_SUBFLOW,
    FAN_OUT_BAR,
]

# -- the introduction's graphs (drawn without a flow text); flows that give them -------------

INTRO_GRAPH = """stateDiagram-v2
A --> B
A --> C
C --> D
E --> F
E --> G
"""
INTRO_GRAPH_WITH_START_END = """stateDiagram-v2
[*] --> A
A --> B
B --> [*]
A --> C
C --> D
D --> [*]
[*] --> E
E --> F
E --> G
F --> [*]
G --> [*]
"""
INTRO_GRAPH_FLOW = "A :a → B ;\n:a → C → D ;\nE :e → F ;\n:e → G"
INFORMATION_FLOW = """stateDiagram-v2
[*] --> A
A --> B
B --> [*]
A --> C
C --> D
D --> [*]
"""
INFORMATION_FLOW_FLOW = "A :a → B ;\n:a → C → D"

# -- examples without a diagram --------------------------------------------------------------

PIPELINE = "transform → inference → store"
PIPELINE_MULTILINE = "transform →\ninference →\nstore"
DUPLICATE_OUTPUT_LABEL = "A :x → B → C :x → D"
LABEL_FORMS_OK = ["A :x", ":x A"]
LABEL_FORMS_DANGLING = [":x → A", "A → :x", "A → B → C → :after"]
NO_START_EDGE = "A → :x C;\nB → :x;"
TWO_INVOCATIONS = "A → C\nB → C"
ONE_INVOCATION = "A → :meet C\nB → :meet"
RESOURCE_LOAD = "<dataset.json> → inference → store"
RESOURCE_STORE = "load → score → <http://example.com/myservice/api/v1/store>"
RESOURCE_STORE_PUT = "load → score → <http://example.com/myscores.json>(- method: PUT -)"
TASK_NAME = "my:peel-banana"
RANGE_PARAMS = "range(- {start: 1, end: 10} -)"
PARAMETERIZED = 'A (- delete: true -) → B ({"flush":true})'
INLINE_YAML = "(- {start: 10, end: 50} -)"
MULTILINE_YAML = "(-\nstart: 10\nend: 50\n-)"
LITERAL_SOURCE = "<- customer: C123 -> → A → B"
FLOW_DECLARATION = "@flow test '''\nThis is a test workflow.\n'''"
TASK_DECLARATION = "@task A (- dry-run: false -) '''\nTask A has a single parameter of `dry-run` which is a boolean value.\n''';"
ALIAS = "@task X = A (- {fruit: banana} -) ;\nX → B"
ALIAS_EXPANDED = "A (- {fruit: banana} -) → B"
DECLARED_SUBFLOW = "@task X {\nA\nB → C\n}\nX → D"
DECLARED_SUBFLOW_EXPANDED = "{\nA\nB → C\n} → D"
GUARD = "A → ? `$[?(@.status=0)]` B"
GUARD_SUBFLOW = "A → ? `$[?(@.status=0)]` { B → C }"
GUARDS_IN_SUBFLOW = "A → { ? `$[?(@.status=0)]` B\n? `$[?(@.status>0)]` C\n? `$[?(@.status>1)]` D } → E"
GUARD_ONE_STEP = "A → ? `$[?(@.status=0)]` B → C"
ITERATE = "<seqeuence.json> → * A"
SEQUENCE_JSON = '{"x":12,"y":24}\n{"x":3,"y":96}\n{"x":7,"y":12}\n{"x":7,"y":7}\n'
SUBFLOW_BLOCK = "A → {\nB → C\nD\n} → E"
SUBFLOW_BLOCK_LABELS = "A :out → B → C → :in E ;\n:out → D → :in"
ITERATE_SUBFLOW = "A → * {\nB → C\nD\n} → E"
ITERATE_SUBFLOW_LABELS = "A :out → * B → * C → :in E ;\n:out → * D → :in"
