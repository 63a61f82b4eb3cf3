"""Random token trees for the tests of tree walks (structured outputs, constrained drafts)."""


def random_tree(rng, tokens_from, vocab, n):
    """(parents, tokens) of an n-node tree (node 0 the root, token 0): each node under a random
    earlier one, its token drawn from ``tokens_from`` 85% of the time, else from [0, vocab),
    never a sibling's."""
    parents, tokens = [-1], [0]
    for i in range(1, n):
        parent = int(rng.integers(0, i))
        siblings = {tokens[j] for j in range(1, i) if parents[j] == parent}
        token = int(rng.choice(tokens_from)) if rng.random() < 0.85 else int(rng.integers(0, vocab))
        while token in siblings:
            token = int(rng.integers(0, vocab))
        parents.append(parent)
        tokens.append(token)
    return parents, tokens


def path_of(parents, tokens, node):
    """The tokens from the root's child down to ``node``."""
    out = []
    while node > 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]
