"""Audio codecs of the text-to-speech path: the talker's token layout and the decoders that turn codes into audio."""
