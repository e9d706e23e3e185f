"""The model card is published: a source's local path shows by its last name only, each entry of a comma-separated
list on its own, whatever the first entry is; URLs, hub names and paths inside the project show as given."""
from pretrain.exporting.model_card import shown


def test_each_local_path_of_a_list_shows_by_its_name():
    assert shown("data/kjv.txt,/home/alice/private/notes.txt") == "data/kjv.txt,notes.txt"
    assert shown("/home/alice/corpus.txt") == "corpus.txt"
    assert shown("../../home/alice/c.txt, ~/d.txt") == "c.txt,d.txt"
    assert shown("s3://corpus/kjv,wikitext,data/a.txt") == "s3://corpus/kjv,wikitext,data/a.txt"
    assert shown(None) is None and shown("") == ""
