"""The profiles a user can serve: the recipe's plus custom ones (`custom`: clone, change knobs, the card's
warnings, save), listed by one `registry` built beside the settings. docs/card.md."""
