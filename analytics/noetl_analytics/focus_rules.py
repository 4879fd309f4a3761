"""Checks a FOCUS export against the FOCUS 1.2 rules it can break (our own encoding of them).

The validator on PyPI only knows FOCUS 1.0-preview, so these are written from the
specification text (FOCUS_Spec, tag v1.2, ``specification/attributes`` and
``specification/columns``): one error string per broken rule and row, ``[]`` when the
export conforms. CSV text is checked as written (formats); Parquet is typed, so only the
column and value rules apply there.
"""

from __future__ import annotations

import csv
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
# columns/pricingquantity.md, listunitprice.md, pricingcategory.md: not null for Usage/Purchase
# rows that are not corrections; consumedquantity.md: not null for such Usage rows, null otherwise
PRICED = ("PricingQuantity", "PricingUnit", "ListUnitPrice", "PricingCategory")


def _null(v: object) -> bool:
    return v is None or v == ""


def check_rows(columns: Iterable[str], rows: Iterable[dict[str, object]], *, text: bool) -> list[str]:
    """The rule violations of ``rows`` (``text``: values as written in a CSV file)."""
    cols = list(columns)
    errors = [f"missing mandatory column {c}" for c in MANDATORY if c not in cols]
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
