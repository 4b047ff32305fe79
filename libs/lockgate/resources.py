"""Resource quantities: parsing Kubernetes quantities and arithmetic on resource vectors.

Why here: every part of lockgate (admission, ingest, fairness) compares requests against capacity,
and they must agree to the last millicore. Quantities are held as integers in canonical units:
cpu in millicores, memory and ephemeral-storage in bytes, everything else in whole units.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]{0,2})$")


class InvalidQuantityError(ValueError):
    """A Kubernetes quantity string that cannot be parsed."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "1Gi", "2") into a Decimal of base units."""
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise InvalidQuantityError(f"invalid quantity {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation as error:
        raise InvalidQuantityError(f"invalid quantity {text!r}") from error


def canonical_amount(resource: str, text: str | int | float) -> int:
    """A quantity in lockgate's canonical integer unit for that resource (cpu: millicores)."""
    value = parse_quantity(text)
    if resource == "cpu":
        value = value * 1000
    # Round up: a request of 0.5m cpu still occupies capacity.
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


class Resources(Mapping[str, int]):
    """An immutable vector of resource amounts in canonical units; missing resources are zero."""

    __slots__ = ("_amounts",)

    def __init__(self, amounts: Mapping[str, int] | None = None) -> None:
        self._amounts: dict[str, int] = {k: v for k, v in (amounts or {}).items() if v != 0}

    @classmethod
    def from_kubernetes(cls, quantities: Mapping[str, str | int | float] | None) -> Resources:
        """Build from a Kubernetes resource list, e.g. {"cpu": "500m", "memory": "1Gi"}."""
        return cls({name: canonical_amount(name, q) for name, q in (quantities or {}).items()})

    @classmethod
    def sum(cls, vectors: Iterable[Mapping[str, int]]) -> Resources:
        total: dict[str, int] = {}
        for vector in vectors:
            for name, amount in vector.items():
                total[name] = total.get(name, 0) + amount
        return cls(total)

    def __getitem__(self, name: str) -> int:
        return self._amounts.get(name, 0)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __add__(self, other: Mapping[str, int]) -> Resources:
        return Resources.sum((self, other))

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        result = dict(self._amounts)
        for name, amount in other.items():
            result[name] = result.get(name, 0) - amount
        return Resources(result)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._amounts == {k: v for k, v in other.items() if v != 0}
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._amounts.items()))

    def __repr__(self) -> str:
        return f"Resources({self._amounts!r})"

    def fits_within(self, capacity: Mapping[str, int]) -> bool:
        """True when every amount requested here is available in `capacity`."""
        return all(amount <= capacity.get(name, 0) for name, amount in self._amounts.items())

    def as_dict(self) -> dict[str, int]:
        return dict(self._amounts)
