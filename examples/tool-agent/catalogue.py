"""The shop's catalogue: what the tools know and the model cannot.

Prices and stock are made up and fixed (a hash of the name), so a model can
only answer by calling the tools.
"""
import hashlib

ITEMS = [
    "apple", "banana", "cherry", "lemon", "mango", "peach", "pear", "plum", "melon", "grape",
    "carrot", "onion", "potato", "tomato", "pepper", "garlic", "ginger", "cabbage", "lettuce", "spinach",
    "bread", "butter", "cheese", "yogurt", "milk", "egg", "rice", "pasta", "flour", "sugar",
    "coffee", "tea", "juice", "honey", "jam", "salt", "oil", "vinegar", "cereal", "cookie",
    "soap", "sponge", "candle", "battery", "bulb", "towel", "brush", "bucket", "glove", "napkin",
]


def _h(name: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:4], "big")


CATALOGUE = {name: {"price": (_h(name, "price") % 1900 + 100) / 100, "stock": _h(name, "stock") % 97 + 3} for name in ITEMS}
