// placeholder: filled by the speculation issue
