"""Reading a log: its lines (``reader``: plain, gzip, rotated series, damage reported), on the
other core for big logs (``prefetch``), and what each record means (``decode``)."""
