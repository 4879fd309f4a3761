"""Checks a FOCUS export against the FOCUS 1.2 rules it can break (our own encoding of them).

The validator on PyPI only knows FOCUS 1.0-preview, so these are written from the
specification text (FOCUS_Spec, tag v1.2, ``specification/attributes`` and
``specification/columns``): one error string per broken rule and row, ``[]`` when the
export conforms. CSV text is checked as written (formats); Parquet is typed, so only the
column and value rules apply there.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

# columns "Feature level: Mandatory" in v1.2, and those of them that do not allow nulls
MANDATORY = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
    "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodEnd",
    "ChargePeriodStart", "ContractedCost", "EffectiveCost", "InvoiceIssuerName", "ListCost", "PricingQuantity",
    "PricingUnit", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
)  # fmt: skip
NOT_NULL = (
    "BilledCost", "BillingAccountId", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart",
    "ChargeCategory", "ChargePeriodEnd", "ChargePeriodStart", "ContractedCost", "EffectiveCost",
    "InvoiceIssuerName", "ListCost", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
)  # fmt: skip
# attributes/datetime_format.md: 'YYYY-MM-DDTHH:mm:ssZ'
DATETIME_COLUMNS = ("BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
DECIMAL_COLUMNS = (
    "BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "ListCost",
    "ListUnitPrice", "PricingQuantity",
)  # fmt: skip
# attributes/numeric_format.md allows "mEn" too; we hold exports to plain decimals (spreadsheets and
# the FOCUS sandbox read them as text otherwise), so any exponent is an error here
_DECIMAL = re.compile(r"-?\d+(\.\d+)?")
ALLOWED = {  # columns/<name>.md "Allowed values"
    "ChargeCategory": {"Usage", "Purchase", "Tax", "Credit", "Adjustment"},
    "ChargeClass": {"Correction"},
    "ChargeFrequency": {"One-Time", "Recurring", "Usage-Based"},
    "PricingCategory": {"Standard", "Dynamic", "Committed", "Other"},
    "ServiceCategory": {
        "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases", "Developer Tools",
        "Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance", "Media",
        "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other",
    },
}  # fmt: skip
# columns/servicesubcategory.md: each allowed subcategory and its one parent ServiceCategory
SUBCATEGORIES = {
    "AI and Machine Learning": ("AI Platforms", "Bots", "Generative AI", "Machine Learning",
                                "Natural Language Processing", "Other (AI and Machine Learning)"),
    "Analytics": ("Analytics Platforms", "Business Intelligence", "Data Processing", "Search", "Streaming Analytics",
                  "Other (Analytics)"),
    "Business Applications": ("Productivity and Collaboration", "Other (Business Applications)"),
    "Compute": ("Containers", "End User Computing", "Quantum Compute", "Serverless Compute", "Virtual Machines",
                "Other (Compute)"),
    "Databases": ("Caching", "Data Warehouses", "Ledger Databases", "NoSQL Databases", "Relational Databases",
                  "Time Series Databases", "Other (Databases)"),
    "Developer Tools": ("Developer Platforms", "Continuous Integration and Deployment", "Development Environments",
                        "Source Code Management", "Quality Assurance", "Other (Developer Tools)"),
    "Identity": ("Identity and Access Management", "Other (Identity)"),
    "Integration": ("API Management", "Messaging", "Workflow Orchestration", "Other (Integration)"),
    "Internet of Things": ("IoT Analytics", "IoT Platforms", "Other (Internet of Things)"),
    "Management and Governance": ("Architecture", "Compliance", "Cost Management", "Data Governance",
                                  "Disaster Recovery", "Endpoint Management", "Observability", "Support",
                                  "Other (Management and Governance)"),
    "Media": ("Content Creation", "Gaming", "Media Streaming", "Mixed Reality", "Other (Media)"),
    "Migration": ("Data Migration", "Resource Migration", "Other (Migration)"),
    "Mobile": ("Other (Mobile)",),
    "Multicloud": ("Multicloud Integration", "Other (Multicloud)"),
    "Networking": ("Application Networking", "Content Delivery", "Network Connectivity", "Network Infrastructure",
                   "Network Routing", "Network Security", "Other (Networking)"),
    "Security": ("Secret Management", "Security Posture Management", "Threat Detection and Response",
                 "Other (Security)"),
    "Storage": ("Backup Storage", "Block Storage", "File Storage", "Object Storage", "Storage Platforms",
                "Other (Storage)"),
    "Web": ("Application Platforms", "Other (Web)"),
    "Other": ("Other (Other)",),
}  # fmt: skip
PARENT = {sub: cat for cat, subs in SUBCATEGORIES.items() for sub in subs}
# attributes/unit_format.md: data sizes abbreviated as listed, time units as listed, count nouns capitalized;
# "<plural-units>", "<singular-unit>-<plural-time-units>", "<plural-units>/<singular-time-unit>",
# "<quantity> <plural-units>", "<plural-units>/<interval> <plural-time-units>"
_SIZES = "|".join(
    p + u for p in ("", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei") for u in ("b", "B")
)
_TIME = "Year|Month|Day|Hour|Minute|Second"
_NOUN = rf"(?:{_SIZES}|[A-Z][A-Za-z]*)"
_UNIT_FORMATS = re.compile(
    rf"(?:\d+ )?{_NOUN}|{_NOUN}-(?:{_TIME})s|{_NOUN}/(?:{_TIME})|{_NOUN}/\d+ (?:{_TIME})s"
)
# a spelled-out data size is not a count noun: "Gigabytes" must be "GB"
_SPELLED_SIZE = re.compile(r"(?i)(kilo|mega|giga|tera|peta|exa|kibi|mebi|gibi|tebi|pebi|exbi)?(bit|byte)s?")
UNIT_COLUMNS = ("PricingUnit", "ConsumedUnit")
# columns these exports must have beyond the mandatory ones
PRESENT = {
    "SkuPriceDetails": "MUST be present when the provider publishes price lists (the price file is one)",
    "ServiceSubcategory": "RECOMMENDED; NoETL exports it",
}
# columns/skupricedetails.md: FOCUS-defined properties and their types; any other key begins "x_"
SKU_PROPERTIES = {
    "CoreCount": (int, float), "DiskMaxIops": (int, float), "DiskSpace": (int, float), "DiskType": str,
    "GpuCount": (int, float), "InstanceType": str, "InstanceSeries": str, "MemorySize": (int, float),
    "NetworkMaxIops": (int, float), "NetworkMaxThroughput": (int, float), "OperatingSystem": str,
    "Redundancy": str, "StorageClass": str,
}  # fmt: skip
# columns/pricingquantity.md, listunitprice.md, pricingcategory.md: not null for Usage/Purchase
# rows that are not corrections; consumedquantity.md: not null for such Usage rows, null otherwise
PRICED = ("PricingQuantity", "PricingUnit", "ListUnitPrice", "PricingCategory")


def _null(v: object) -> bool:
    return v is None or v == ""


def unit_errors(unit: str) -> list[str]:
    """Why ``unit`` breaks the FOCUS UnitFormat (``[]``: it conforms)."""
    if not _UNIT_FORMATS.fullmatch(unit):
        return [f"{unit!r} is not in the UnitFormat (e.g. 'GB', 'GB-Hours', 'Requests/Day', '1000 Requests')"]
    nouns = re.split(r"[-/ ]", unit)
    if any(_SPELLED_SIZE.fullmatch(n) for n in nouns):
        return [f"{unit!r} spells out a data size (UnitFormat: 'GB', 'GiB', ...)"]
    if any(re.fullmatch(rf"(?:{_SIZES})s", n) for n in nouns):
        return [f"{unit!r}: a data size abbreviation is its own plural ('GB', not 'GBs')"]
    return []


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def key_value_errors(text: object, column: str) -> list[str]:
    """attributes/key_value_format.md: a serialized JSON object, unique keys, scalar values; for
    SkuPriceDetails also its key rules (FOCUS-defined keys with their types, others ``x_``)."""
    try:
        value = json.loads(str(text), object_pairs_hook=_unique_keys)
    except ValueError as e:
        return [f"{column} is not a JSON object: {e}"]
    if not isinstance(value, dict):
        return [f"{column} is not a JSON object"]
    errors = [
        f"{column} value of {k!r} is an object or array"
        for k, v in value.items()
        if isinstance(v, (dict, list))
    ]
    if column == "SkuPriceDetails":
        for k, v in value.items():
            want = SKU_PROPERTIES.get(k)
            if want is None and not k.startswith("x_"):
                errors.append(f"SkuPriceDetails key {k!r} is neither FOCUS-defined nor begins with 'x_'")
            elif want is not None and (isinstance(v, bool) or not isinstance(v, want)):
                errors.append(f"SkuPriceDetails {k} {v!r} is not of the type FOCUS defines")
    return errors


def check_rows(columns: Iterable[str], rows: Iterable[dict[str, object]], *, text: bool) -> list[str]:
    """The rule violations of ``rows`` (``text``: values as written in a CSV file)."""
    cols = list(columns)
    errors = [f"missing mandatory column {c}" for c in MANDATORY if c not in cols]
    errors += [f"missing column {c} (FOCUS: {why})" for c, why in PRESENT.items() if c not in cols]
    for i, row in enumerate(rows, start=2 if text else 0):  # CSV: line numbers after the header
        at = f"row {i}"
        for c in NOT_NULL:
            if c in row and _null(row[c]):
                errors.append(f"{at}: {c} is null")
        for c, allowed in ALLOWED.items():
            if not _null(row.get(c)) and row[c] not in allowed:
                errors.append(f"{at}: {c} {row[c]!r} is not an allowed value")
        if text:
            for c in DATETIME_COLUMNS:
                if not _null(row.get(c)) and not _DATETIME.fullmatch(str(row[c])):
                    errors.append(f"{at}: {c} {row[c]!r} is not YYYY-MM-DDTHH:mm:ssZ")
            for c in DECIMAL_COLUMNS:
                if not _null(row.get(c)) and not _DECIMAL.fullmatch(str(row[c])):
                    errors.append(f"{at}: {c} {row[c]!r} is not a plain decimal")
        for c in UNIT_COLUMNS:
            if not _null(row.get(c)):
                errors += [f"{at}: {c} {e}" for e in unit_errors(str(row[c]))]
        if "ServiceSubcategory" in cols:
            sub = row.get("ServiceSubcategory")
            if _null(sub):
                errors.append(f"{at}: ServiceSubcategory is null")
            elif sub not in PARENT:
                errors.append(f"{at}: ServiceSubcategory {sub!r} is not an allowed value")
            elif PARENT[sub] != row.get("ServiceCategory"):
                errors.append(f"{at}: ServiceSubcategory {sub!r} belongs to {PARENT[sub]!r}, "
                              f"not to ServiceCategory {row.get('ServiceCategory')!r}")  # fmt: skip
        if not _null(row.get("SkuPriceDetails")):
            if _null(row.get("SkuPriceId")):
                errors.append(f"{at}: SkuPriceDetails is set while SkuPriceId is null")
            errors += [f"{at}: {e}" for e in key_value_errors(row["SkuPriceDetails"], "SkuPriceDetails")]
        if not _null(row.get("Tags")):
            errors += [f"{at}: {e}" for e in key_value_errors(row["Tags"], "Tags")]
        category, correction = row.get("ChargeCategory"), not _null(row.get("ChargeClass"))
        if category in ("Usage", "Purchase") and not correction:
            errors += [f"{at}: {c} is null on a {category} row" for c in PRICED if c in row and _null(row[c])]
        if (
            category == "Usage"
            and not correction
            and "ConsumedQuantity" in row
            and _null(row["ConsumedQuantity"])
        ):
            errors.append(f"{at}: ConsumedQuantity is null on a Usage row")
        if category != "Usage" and not _null(row.get("ConsumedQuantity")):
            errors.append(f"{at}: ConsumedQuantity is set on a {category} row")
        if not _null(row.get("PricingQuantity")) and _null(row.get("PricingUnit")):
            errors.append(f"{at}: PricingUnit is null while PricingQuantity is set")
        if not _null(row.get("ConsumedQuantity")) and _null(row.get("ConsumedUnit")):
            errors.append(f"{at}: ConsumedUnit is null while ConsumedQuantity is set")
        if (
            not _null(row.get("SubAccountId"))
            and "SubAccountType" in cols
            and _null(row.get("SubAccountType"))
        ):
            errors.append(f"{at}: SubAccountType is null while SubAccountId is set")
        try:
            price, qty, cost = (float(row[c]) for c in ("ListUnitPrice", "PricingQuantity", "ListCost"))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            continue
        if price < 0:
            errors.append(f"{at}: ListUnitPrice {price} is negative")
        if not correction and not math.isclose(price * qty, cost, rel_tol=1e-6, abs_tol=1e-12):
            errors.append(f"{at}: ListUnitPrice x PricingQuantity = {price * qty!r} is not ListCost {cost!r}")
    return errors


def check_csv(path: str | Path) -> list[str]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return check_rows(reader.fieldnames or [], reader, text=True)


def check_table(table: object) -> list[str]:
    """A pyarrow table (Parquet): column and value rules."""
    return check_rows(table.column_names, table.to_pylist(), text=False)  # type: ignore[attr-defined]
