"""The generator's word tables: categories, product types, attributes, option groups, brands, colours.

Everything here is our own invented vocabulary. `PRODUCT_TYPE_NOUNS` and `NON_NOUN_WORDS` also feed the
reward's noun heuristic (see reward.py), which stands in for the original's spaCy noun extraction.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProductTypeSpec", "CategorySpec", "CATEGORIES", "COLORS", "PRODUCT_TYPE_NOUNS", "NON_NOUN_WORDS",
           "BRANDS"]


@dataclass(frozen=True)
class ProductTypeSpec:
    """A kind of product: its head noun (`noun`, e.g. "t-shirt"), the breadcrumb tail, the crawl query."""

    noun: str
    subcategory: str
    query: str


@dataclass(frozen=True)
class CategorySpec:
    """A top-level category: breadcrumb root, product types, attribute phrases, option groups, price range
    (dollars), descriptive adjectives for titles, and sentence stems for descriptions."""

    name: str
    root: str
    types: tuple[ProductTypeSpec, ...]
    attributes: tuple[str, ...]
    option_groups: dict[str, tuple[str, ...]]
    price_range: tuple[float, float]
    adjectives: tuple[str, ...]
    uses: tuple[str, ...]


_COLOR_FAMILIES: dict[str, tuple[str, ...]] = {
    "neutral": ("white", "black", "grey", "gray", "ivory", "cream", "beige", "natural", "nude", "sand", "stone",
                "taupe", "wheat", "alabaster", "seashell", "ash", "slate", "granite", "graphite", "charcoal",
                "steel", "pewter", "asphalt", "silver", "heather", "mushroom", "elephant", "dark", "light"),
    "red": ("red", "rose", "pink", "blush", "coral", "peach", "apricot", "cranberry", "burgundy", "bordeaux",
            "merlot", "wine", "maroon", "magenta", "fuchsia", "rust"),
    "brown": ("brown", "tan", "khaki", "camel", "caramel", "chestnut", "chocolate", "coffee", "cognac", "copper",
              "bronze", "espresso", "mocha", "walnut"),
    "yellow": ("yellow", "gold", "mustard", "lemon", "banana", "sunflower", "champagne", "orange"),
    "green": ("green", "olive", "lime", "mint", "ivy", "grass", "teal"),
    "blue": ("blue", "navy", "azure", "aqua", "turquoise", "sapphire", "indigo", "denim", "midnight", "royal",
             "stonewash"),
    "purple": ("purple", "violet", "lavender", "lilac", "plum", "grape", "eggplant", "mauve"),
    "pattern": ("camo", "cheetah", "leopard", "tiger", "skull", "rainbow", "multicolor", "crystal", "christmas"),
}

COLORS: tuple[str, ...] = tuple(sorted(c for family in _COLOR_FAMILIES.values() for c in family))
"""The colour words of WebShop's colour normalisation (the same 102 words as the original), in the order it
tries them: alphabetical, and the first one that is a substring of the option text wins (so "navy blue" and
"royal blue" both normalise to "blue", and "light pink" to "light")."""

_PLAIN_COLORS = (
    "black", "white", "navy", "blue", "red", "green", "olive", "grey", "gray", "beige", "brown", "pink",
    "purple", "yellow", "orange", "teal", "khaki", "burgundy", "silver", "gold", "ivory", "charcoal", "coral",
    "mint", "lavender", "tan", "maroon", "turquoise", "cream", "multicolor",
)
# Colour words the noun heuristic never counts as nouns. Not COLORS: that list also holds words that are
# nouns in titles ("coffee", "chocolate", "stone", "crystal").

_APPAREL_COLORS = ("black", "white", "navy blue", "heather grey", "red", "olive green", "burgundy", "khaki",
                   "light pink", "royal blue", "charcoal", "mint green", "mustard yellow", "purple")
_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")
_SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")
_HOME_COLORS = ("white", "ivory", "grey", "charcoal", "beige", "navy", "sage green", "terracotta", "black")

CATEGORIES: dict[str, CategorySpec] = {
    spec.name: spec
    for spec in (
        CategorySpec(
            name="apparel",
            root="Clothing",
            types=(
                ProductTypeSpec("t-shirt", "Men › Shirts › T-Shirts", "men's t-shirts"),
                ProductTypeSpec("hoodie", "Women › Fashion Hoodies & Sweatshirts", "hoodies for women"),
                ProductTypeSpec("jeans", "Men › Jeans", "slim fit jeans"),
                ProductTypeSpec("dress", "Women › Dresses", "summer dresses"),
                ProductTypeSpec("jacket", "Men › Jackets & Coats", "rain jacket"),
                ProductTypeSpec("leggings", "Women › Active › Leggings", "workout leggings"),
                ProductTypeSpec("pajama set", "Women › Sleep & Lounge", "pajama set"),
            ),
            attributes=("machine wash", "cotton", "polyester spandex", "slim fit", "relaxed fit", "long sleeve",
                        "short sleeve", "button closure", "elastic waist", "moisture wicking", "quick dry",
                        "hand wash", "tumble dry", "pull on closure", "high waist", "classic fit"),
            option_groups={"color": _APPAREL_COLORS, "size": _SIZES},
            price_range=(9.0, 79.0),
            adjectives=("casual", "classic", "lightweight", "soft", "breathable", "vintage", "stretchy"),
            uses=("everyday wear", "the gym", "lounging at home", "travel", "the office"),
        ),
        CategorySpec(
            name="footwear",
            root="Shoes",
            types=(
                ProductTypeSpec("sneakers", "Men › Fashion Sneakers", "men's sneakers"),
                ProductTypeSpec("running shoes", "Women › Athletic › Running", "running shoes for women"),
                ProductTypeSpec("sandals", "Women › Sandals", "flat sandals"),
                ProductTypeSpec("boots", "Men › Boots", "work boots"),
                ProductTypeSpec("slippers", "Women › Slippers", "house slippers"),
                ProductTypeSpec("loafers", "Men › Loafers & Slip-Ons", "leather loafers"),
            ),
            attributes=("non slip", "rubber sole", "memory foam", "arch support", "waterproof", "breathable mesh",
                        "lace up", "slip on", "leather upper", "lightweight", "cushioned insole", "anti skid"),
            option_groups={"color": ("black", "white", "grey", "navy", "brown", "tan", "red", "pink", "beige"),
                           "size": _SHOE_SIZES},
            price_range=(15.0, 140.0),
            adjectives=("comfortable", "durable", "casual", "athletic", "classic", "walking"),
            uses=("walking", "running", "work", "everyday wear", "the beach"),
        ),
        CategorySpec(
            name="home",
            root="Home & Kitchen",
            types=(
                ProductTypeSpec("throw pillow covers", "Bedding › Decorative Pillows", "throw pillow covers"),
                ProductTypeSpec("bed sheets", "Bedding › Sheets & Pillowcases", "queen sheet set"),
                ProductTypeSpec("blackout curtains", "Home Decor › Window Treatments", "blackout curtains"),
                ProductTypeSpec("bath towels", "Bath › Towels", "bath towel set"),
                ProductTypeSpec("area rug", "Home Decor › Rugs", "living room rug"),
                ProductTypeSpec("storage basket", "Storage & Organization › Baskets", "storage basket"),
            ),
            attributes=("easy clean", "machine washable", "eco friendly", "long lasting", "super soft",
                        "fade resistant", "thermal insulated", "living room", "bedroom", "space saving",
                        "wrinkle free", "quick drying", "non toxic"),
            option_groups={"color": _HOME_COLORS, "size": ("twin", "full", "queen", "king", "18 x 18 inch",
                                                          "20 x 20 inch", "52 x 84 inch", "4 x 6 ft", "5 x 7 ft")},
            price_range=(12.0, 160.0),
            adjectives=("modern", "farmhouse", "cozy", "minimalist", "decorative", "premium"),
            uses=("the living room", "the bedroom", "guest rooms", "the nursery", "everyday use"),
        ),
        CategorySpec(
            name="electronics",
            root="Electronics",
            types=(
                ProductTypeSpec("wireless earbuds", "Headphones › Earbud Headphones", "bluetooth earbuds"),
                ProductTypeSpec("phone case", "Cell Phones & Accessories › Cases", "phone case"),
                ProductTypeSpec("usb charger", "Accessories › Chargers", "fast charger"),
                ProductTypeSpec("portable speaker", "Portable Audio › Speakers", "bluetooth speaker"),
                ProductTypeSpec("hdmi cable", "Accessories › Cables", "hdmi cable"),
                ProductTypeSpec("power bank", "Accessories › Power Banks", "portable charger"),
            ),
            attributes=("fast charging", "noise cancelling", "high definition", "easy install", "long battery life",
                        "water resistant", "wireless charging", "usb c", "shockproof", "plug and play",
                        "hands free", "high speed", "compact design"),
            option_groups={"color": ("black", "white", "silver", "blue", "red", "gold", "green"),
                           "style": ("standard", "pro", "2 pack", "3 pack", "6 ft", "10 ft", "mini")},
            price_range=(8.0, 199.0),
            adjectives=("portable", "compact", "premium", "smart", "rugged", "slim"),
            uses=("travel", "the office", "the car", "home theater", "workouts"),
        ),
        CategorySpec(
            name="beauty",
            root="Beauty & Personal Care",
            types=(
                ProductTypeSpec("hair extensions", "Hair Care › Extensions & Wigs", "clip in hair extensions"),
                ProductTypeSpec("lipstick", "Makeup › Lips", "matte lipstick"),
                ProductTypeSpec("face moisturizer", "Skin Care › Face › Moisturizers", "face moisturizer"),
                ProductTypeSpec("shampoo", "Hair Care › Shampoo & Conditioner", "sulfate free shampoo"),
                ProductTypeSpec("nail polish", "Foot, Hand & Nail Care › Nail Polish", "gel nail polish"),
                ProductTypeSpec("eyeshadow palette", "Makeup › Eyes", "eyeshadow palette"),
            ),
            attributes=("cruelty free", "paraben free", "long lasting", "natural ingredients", "sulfate free",
                        "dry skin", "sensitive skin", "easy apply", "travel size", "fragrance free",
                        "natural looking", "hair loss", "vegan"),
            option_groups={"color": ("natural black", "dark brown", "ash blonde", "ruby red", "nude", "coral",
                                     "plum", "clear"),
                           "size": ("0.5 ounce", "1 fl oz", "1.7 fl oz", "8 fl oz", "16 inch", "20 inch")},
            price_range=(5.0, 65.0),
            adjectives=("gentle", "nourishing", "lightweight", "luxury", "hydrating", "professional"),
            uses=("daily use", "sensitive skin", "special occasions", "travel", "salon results at home"),
        ),
        CategorySpec(
            name="grocery",
            root="Grocery & Gourmet Food",
            types=(
                ProductTypeSpec("protein bars", "Snacks › Nutrition Bars", "protein bars"),
                ProductTypeSpec("green tea", "Beverages › Tea", "green tea bags"),
                ProductTypeSpec("coffee beans", "Beverages › Coffee", "whole bean coffee"),
                ProductTypeSpec("trail mix", "Snacks › Nuts & Trail Mix", "trail mix"),
                ProductTypeSpec("olive oil", "Pantry › Oils", "extra virgin olive oil"),
                ProductTypeSpec("dark chocolate", "Candy & Chocolate", "dark chocolate bar"),
            ),
            attributes=("gluten free", "non gmo", "low sugar", "high protein", "keto friendly", "organic",
                        "sugar free", "ready to eat", "individually wrapped", "dairy free", "low calorie",
                        "plant based", "kosher"),
            option_groups={"flavor": ("chocolate", "peanut butter", "vanilla", "mixed berry", "original",
                                      "sea salt", "honey", "mint"),
                           "size": ("12 count", "24 count", "8 ounce", "16 ounce", "2 pound", "pack of 3")},
            price_range=(4.0, 48.0),
            adjectives=("healthy", "delicious", "premium", "crunchy", "fresh", "smooth"),
            uses=("snacking", "breakfast", "the office", "hiking", "family meals"),
        ),
        CategorySpec(
            name="sports",
            root="Sports & Outdoors",
            types=(
                ProductTypeSpec("yoga mat", "Exercise & Fitness › Yoga", "yoga mat"),
                ProductTypeSpec("water bottle", "Outdoor Recreation › Hydration", "insulated water bottle"),
                ProductTypeSpec("dumbbells", "Exercise & Fitness › Strength Training", "adjustable dumbbells"),
                ProductTypeSpec("camping tent", "Outdoor Recreation › Camping", "camping tent"),
                ProductTypeSpec("resistance bands", "Exercise & Fitness › Accessories", "resistance bands set"),
            ),
            attributes=("non slip", "bpa free", "leak proof", "easy assemble", "heavy duty", "double wall",
                        "lightweight", "carrying strap", "high density", "eco friendly", "weather resistant"),
            option_groups={"color": ("black", "purple", "teal", "pink", "grey", "orange", "navy", "olive"),
                           "size": ("18 oz", "32 oz", "40 oz", "6 mm", "10 mm", "2 person", "4 person",
                                    "15 lb", "25 lb")},
            price_range=(10.0, 180.0),
            adjectives=("durable", "portable", "professional", "compact", "premium", "outdoor"),
            uses=("home workouts", "the gym", "camping", "hiking", "yoga classes"),
        ),
        CategorySpec(
            name="furniture",
            root="Home & Kitchen › Furniture",
            types=(
                ProductTypeSpec("office chair", "Home Office Furniture › Chairs", "ergonomic office chair"),
                ProductTypeSpec("bookshelf", "Living Room Furniture › Bookcases", "bookshelf"),
                ProductTypeSpec("coffee table", "Living Room Furniture › Tables", "coffee table"),
                ProductTypeSpec("bar stools", "Kitchen & Dining Room Furniture › Stools", "bar stools set of 2"),
                ProductTypeSpec("nightstand", "Bedroom Furniture › Nightstands", "nightstand"),
            ),
            attributes=("easy assemble", "solid wood", "lumbar support", "height adjustable", "storage space",
                        "metal frame", "living room", "space saving", "mid century", "assembly required",
                        "heavy duty", "engineered wood"),
            option_groups={"color": ("black", "white", "walnut", "espresso", "oak", "grey", "rustic brown"),
                           "style": ("standard", "with drawer", "2 tier", "3 tier", "5 tier", "set of 2",
                                     "with wheels")},
            price_range=(35.0, 420.0),
            adjectives=("modern", "rustic", "industrial", "ergonomic", "sturdy", "minimalist"),
            uses=("the home office", "the living room", "small spaces", "the bedroom", "the kitchen"),
        ),
    )
}

PRODUCT_TYPE_NOUNS: frozenset[str] = frozenset(
    word for spec in CATEGORIES.values() for t in spec.types for word in t.noun.split()
    if word not in {"wireless", "portable", "usb", "green", "dark", "olive", "throw", "blackout", "area",
                    "running", "office", "coffee", "bar", "face", "nail", "water", "camping", "resistance",
                    "phone", "power", "bed", "bath", "hdmi", "storage", "trail", "protein", "hair", "yoga"}
)
"""Head nouns of the generator's product types ("t-shirt", "earbuds", "chair", …)."""

NON_NOUN_WORDS: frozenset[str] = frozenset(
    {w for spec in CATEGORIES.values() for w in spec.adjectives}
    | set(_PLAIN_COLORS)
    | {
        # function words
        "a", "an", "the", "and", "or", "for", "with", "of", "in", "on", "to", "by", "from", "at", "as", "is",
        "it", "its", "this", "that", "set", "pack", "count", "piece", "pcs", "inch", "ft", "oz", "lb", "mm",
        # common adjectives / participles of product titles
        "men's", "women's", "mens", "womens", "kids", "unisex", "new", "best", "large", "small", "medium",
        "slim", "fit", "long", "short", "high", "low", "soft", "light", "heavy", "extra", "super", "free",
        "easy", "quick", "fast", "non", "anti", "natural", "organic", "premium", "adjustable", "insulated",
        "waterproof", "lightweight", "breathable", "durable", "portable", "compact", "wireless", "classic",
        "modern", "vintage", "casual", "comfortable", "decorative", "cotton", "leather", "wood", "wooden",
        "metal", "solid", "double", "full", "queen", "king", "twin", "mini", "pro", "standard", "dry",
    }
)
"""Words the noun heuristic never counts as nouns: function words, colours, sizes, common adjectives."""

BRANDS = (
    "Northwind", "Lumora", "Cedarline", "Brightpeak", "Oakhaven", "Veloura", "Stormfield", "Pinecrest",
    "Altamira", "Bluefinch", "Corvana", "Driftwell", "Emberly", "Foxglen", "Graniteway", "Halcyon", "Ivyridge",
    "Juniper & Co", "Kestrel", "Larkspur", "Moonbay", "Nimbleton", "Orchid Lane", "Quillmark", "Redwick",
    "Saltmarsh", "Tidewater", "Umberto", "Vantor", "Willowby", "Yarrow", "Zephyra",
)
