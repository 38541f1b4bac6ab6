"""The command as a new user meets it: settings checked first, one-line errors, doctor."""
