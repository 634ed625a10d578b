"""`/v1/audio/speech`: text-to-speech through the tokenizer, llm and vocoder stages."""
