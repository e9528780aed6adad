"""The page's sections, numbered as the page shows them; every view draws them in that order."""
