"""What a generated room may contain, per ALFRED room kind, and what each task type needs.

The room pools are our own choice of ALFRED classes that occur in each kind of room; which receptacle holds
which object, and which objects can be heated/cooled/cleaned, come from ALFRED's own tables
(`assets.alfred_tables`), so that every placement is one ALFWorld's engine accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TASK_TYPES", "ROOM_KINDS", "RoomKind", "TASK_ROOMS", "REQUIRED_RECEPTACLE", "LAMPS", "LAMP_HOLDERS",
           "SCENE_NUMBERS_SEEN", "SCENE_NUMBERS_UNSEEN"]

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""ALFWorld's six task types, in ALFWorld's numbering order (1..6)."""


@dataclass(frozen=True)
class RoomKind:
    name: str
    receptacles: tuple[str, ...]
    """Receptacle classes of the room, most common first; classes listed twice may occur several times."""
    objects: tuple[str, ...]
    """Portable object classes found in this kind of room."""
    scene_base: int
    """ALFRED numbers scenes per room kind: kitchens 1-30, living rooms 201-230, bedrooms 301-330,
    bathrooms 401-430; scenes 1-6 of each kind are the unseen (test) rooms."""


ROOM_KINDS: dict[str, RoomKind] = {
    "Kitchen": RoomKind(
        "Kitchen",
        ("CounterTop", "Cabinet", "Drawer", "Fridge", "Microwave", "SinkBasin", "StoveBurner", "GarbageCan",
         "CoffeeMachine", "DiningTable", "Toaster", "Shelf", "Cabinet", "Drawer", "CounterTop", "StoveBurner",
         "Cabinet", "Drawer"),
        ("Apple", "Bread", "ButterKnife", "Cup", "DishSponge", "Egg", "Fork", "Knife", "Ladle", "Lettuce", "Mug",
         "Pan", "Plate", "Pot", "Potato", "SaltShaker", "PepperShaker", "Spatula", "Spoon", "Tomato", "Bowl",
         "Kettle", "SoapBottle", "WineBottle"),
        0,
    ),
    "LivingRoom": RoomKind(
        "LivingRoom",
        ("Sofa", "ArmChair", "CoffeeTable", "SideTable", "Drawer", "Cabinet", "Shelf", "TVStand", "GarbageCan",
         "DiningTable", "Dresser", "Ottoman", "Safe", "Drawer", "SideTable", "Shelf", "Cabinet"),
        ("Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow", "RemoteControl",
         "Statue", "Vase", "Watch", "WateringCan", "Candle", "Bowl", "Plate", "TissueBox"),
        200,
    ),
    "Bedroom": RoomKind(
        "Bedroom",
        ("Bed", "Desk", "Drawer", "Dresser", "SideTable", "Shelf", "GarbageCan", "LaundryHamper", "Safe",
         "ArmChair", "Drawer", "Shelf", "Drawer"),
        ("AlarmClock", "BaseballBat", "BasketBall", "Book", "CD", "CellPhone", "CreditCard", "KeyChain",
         "Laptop", "Pen", "Pencil", "Pillow", "TennisRacket", "Bowl", "Mug", "Cloth", "Watch"),
        300,
    ),
    "Bathroom": RoomKind(
        "Bathroom",
        ("CounterTop", "SinkBasin", "Cabinet", "Drawer", "GarbageCan", "Toilet", "TowelHolder",
         "HandTowelHolder", "ToiletPaperHanger", "Shelf", "BathtubBasin", "Cabinet", "Drawer", "Cabinet"),
        ("Candle", "Cloth", "DishSponge", "HandTowel", "Plunger", "SoapBar", "SoapBottle",
         "SprayBottle", "ToiletPaper", "Towel", "TissueBox"),
        400,
    ),
}

TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("Kitchen", "LivingRoom", "Bedroom", "Bathroom"),
    "pick_two_obj_and_place": ("Kitchen", "LivingRoom", "Bedroom", "Bathroom"),
    "look_at_obj_in_light": ("LivingRoom", "Bedroom"),
    "pick_clean_then_place_in_recep": ("Kitchen", "Bathroom"),
    "pick_heat_then_place_in_recep": ("Kitchen",),
    "pick_cool_then_place_in_recep": ("Kitchen",),
}
"""Room kinds where ALFRED samples each task type."""

REQUIRED_RECEPTACLE: dict[str, str] = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
"""The appliance a task type cannot be solved without; the target object never starts inside it."""

LAMPS = ("DeskLamp",)
"""Toggleable lamps for look_at tasks (not pickupable; they stand in a receptacle)."""

LAMP_HOLDERS = ("SideTable", "Desk", "Dresser", "Shelf", "CoffeeTable")
"""Receptacle classes a desk lamp may stand on."""

SCENE_NUMBERS_SEEN = tuple(range(7, 31))
"""Scene numbers (within a room kind) used by train and valid_seen."""
SCENE_NUMBERS_UNSEEN = tuple(range(1, 7))
"""Scene numbers reserved for valid_unseen: no train game is laid out in these rooms."""
