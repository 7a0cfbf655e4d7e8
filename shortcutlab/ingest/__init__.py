"""From a dataset as it is released to a crop table: the steps before `audit` and `split`.

Each step is a function and a CLI command, reads a table (or a folder) and writes the table
the next step reads:

- `files`: `shortcutlab table`, a crop table from file paths that match a pattern;
- `locate`: `shortcutlab locate`, each crop found in the released field images (its parent
  and box) by template matching;
- `windows`: `shortcutlab crops`, windows cut from parent images around given coordinates;
- `masks`: `shortcutlab masks`, one estimated cell mask per crop, with quality fields.

It sits beside the data layer: it may use `shortcutlab.data`, never the layers above.
"""
