"""Wire contracts besides System One: each one's Structs and its conversion to and from the
System One call the cascade answers (``openai``: OpenAI's ``POST /v1/decisions``)."""
